"""The beat process (`celery -A app beat`): what it sends where and how often
(app.beat.schedule), its scheduler (app.beat.scheduler), and what it says about
itself (app.beat.process). It holds no state: the schedule is a function of Settings."""
