# memmill: one image for the API, the workers and migrations (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    MEMMILL_DATA_DIR=/data

WORKDIR /app

# Exactly the lock that ./dev installs and CI tests, hashes checked, nothing resolved here. Its
# torch is the CPU build (torch==2.13.0+cpu), which PyTorch's CPU index serves; PyPI's plain
# torch would pull several GB of CUDA libraries. The lock alone is copied first, so a code
# change does not reinstall the dependencies.
COPY requirements.lock ./
RUN pip install --require-hashes --no-deps --extra-index-url https://download.pytorch.org/whl/cpu -r requirements.lock

# Editable on purpose: the code finds sql/ next to its packages (pipeline/db.py).
COPY . .
RUN pip install --no-deps --no-build-isolation -e .

RUN useradd --create-home --uid 1000 memmill \
 && mkdir -p /data \
 && chown memmill:memmill /data
USER memmill

EXPOSE 8700
CMD ["memmill", "api", "--host", "0.0.0.0"]
