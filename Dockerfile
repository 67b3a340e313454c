# One image for every Punctual process: the API, migrate, beat, workers and Flower.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /srv/punctual
COPY setup.cfg pyproject.toml README.md ./
COPY client ./client
COPY app ./app
COPY migrations ./migrations
COPY celeryconfig.py ./
RUN pip install --no-cache-dir ./client ".[otel]" && useradd --system punctual
USER punctual
EXPOSE 8000
CMD ["punctual", "api", "--host", "0.0.0.0", "--port", "8000"]
