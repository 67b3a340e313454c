"""`punctual dev`: the whole stack on one machine with no external service.

Modules: `stack` (what to run, with which environment), `children` (starting and
stopping supervised processes), `credentials` (the dev owner and its key file),
`banner` (what is printed once the stack is up), `broker` (the embedded Celery
broker) and `probe` (the worker's readiness signal). app.cli.dev is the command.
"""
