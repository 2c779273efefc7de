# graft on a CUDA node (README "Scale-out"): CUDA 12.8 runtime + Python 3.11, graft with the `vllm` extra.
#   docker build -t graft .
#   docker run --gpus all --ipc=host --shm-size 16g -v $PWD/results:/work/graft/results -v $HOME/.cache/huggingface:/root/.cache/huggingface graft \
#     accelerate launch --config_file experiments/accelerate/fsdp_4gpu.yaml -m graft_cli.cli train --pair 1 --method graft scale=4xh200
# `vllm` pins its own torch (CUDA build); graft then installs against that torch.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    HF_HOME=/root/.cache/huggingface TOKENIZERS_PARALLELISM=false
RUN apt-get update && apt-get install -y --no-install-recommends \
        software-properties-common git build-essential curl ca-certificates \
    && add-apt-repository -y ppa:deadsnakes/ppa && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /work/graft

# dependencies first (cached layer): vLLM brings its CUDA torch; graft's own pins must accept it
COPY pyproject.toml README.md ./
COPY graft_cli/__init__.py graft_cli/__init__.py
RUN pip install --upgrade pip && pip install -e ".[vllm,dev]"

COPY . .
RUN pip install -e ".[vllm,dev]" --no-deps && python -c "import graft_cli.rollout as r; assert 'vllm' in r.ENGINES.names()"
CMD ["graft", "--help"]
