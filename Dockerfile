# memmill: one image for the API, the workers and migrations (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    MEMMILL_DATA_DIR=/data

# torch first, pinned (the same pin as ./dev) and from the CPU index: otherwise
# sentence-transformers pulls a multi-GB CUDA build.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

WORKDIR /app

# The dependencies alone, from pyproject.toml, so a code change does not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# Editable on purpose: the code finds sql/ next to its packages (pipeline/db.py).
COPY . .
RUN pip install -e .

RUN useradd --create-home --uid 1000 memmill \
 && mkdir -p /data \
 && chown memmill:memmill /data
USER memmill

EXPOSE 8700
CMD ["memmill", "api", "--host", "0.0.0.0"]
