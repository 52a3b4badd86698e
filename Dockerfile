# bsrctl's image for the fleet's Jobs (`bsrctl fleet render`) and the nightly: the pinned
# `gpu` extra (vLLM 0.32.0, LMCache 0.5.6, Mooncake's cuda13 wheel) on a CUDA 13 base, the
# CUDA lmcache 0.5.6 is built for (cuda_ops links libcudart.so.13). bsrctl is the entry
# point; the Jobs pass `COMMAND /spec/spec.yaml --stack KIND --out /results/...`.
#   docker build -t bsrctl:0.1.0 .
# The devel flavour: vLLM's FlashInfer compiles kernels at first use (nvcc).
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04

# Python 3.11 (bsrctl's requires-python), and unshare/nsenter/ip for the network
# namespace a stack with Mooncake puts its parts in (bsrctl/stack/launch/netns.py); fio, the FS
# tier's limit in bench/restore_bandwidth.py.
RUN apt-get update \
 && apt-get install -y --no-install-recommends software-properties-common \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
      iproute2 util-linux ca-certificates fio \
 && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1
RUN python3.11 -m venv /opt/venv

WORKDIR /opt/bsrctl
COPY pyproject.toml ./
COPY bsrctl ./bsrctl
# the mechanisms (bsrkv), which bsrctl depends on
COPY mechanisms ./mechanisms
# relative paths in the shipped specs (ladders/models/*/config.json) resolve from here
COPY ladders ./ladders
RUN pip install ./mechanisms '.[gpu]' && pip check

ENTRYPOINT ["bsrctl"]
CMD ["--help"]
