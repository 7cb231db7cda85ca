#!/usr/bin/env bash
# Start the r3rag retrieval service on a cluster node.
#
#   CONFIG=retriever.yaml bash launch/serve_retriever.sh [--dry-run] [more r3rag retriever serve flags]
#
# The config decides everything the variables below leave unset. Variables:
#   CONFIG     retriever.yaml with FlashRAG's retriever keys (retrieval_method, index_path, corpus_path, ...)
#   HOST       bind address [the config's, else 127.0.0.1; trainer nodes on other hosts need 0.0.0.0]
#   PORT       port [the config's, else 8000]
#   FAISS_GPU  auto|true|false [auto: put the faiss index on the GPUs when faiss sees any]
#   REPLICAS   serve through Ray Serve with this many replicas, on the Ray cluster of $RAY_ADDRESS
#              (launch/cluster/ray_head.sh) or a local one [unset: one process, no Ray]
#   R3RAG      the r3rag command [r3rag]
#   R3RAG_RETRIEVER_API_KEY  bearer token clients must send (read from the environment, never the command line)
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"
split_dry_run "$@"

CONFIG="${CONFIG:?set CONFIG to a retriever.yaml (see docs/components/retrieval.md)}"
FAISS_GPU="${FAISS_GPU:-auto}"
R3RAG="${R3RAG:-r3rag}"

if [[ "$FAISS_GPU" == "auto" ]]; then
    if python3 -c "import faiss, sys; sys.exit(0 if faiss.get_num_gpus() > 0 else 1)" 2>/dev/null; then
        FAISS_GPU=true
    fi
fi

cmd=("$R3RAG" retriever serve --config "$CONFIG")
if [[ -n "${HOST:-}" ]]; then cmd+=(--service.host "$HOST"); fi
if [[ -n "${PORT:-}" ]]; then cmd+=(--service.port "$PORT"); fi
if [[ "$FAISS_GPU" == "true" ]]; then cmd+=(--faiss_gpu); elif [[ "$FAISS_GPU" == "false" ]]; then cmd+=(--no-faiss_gpu); fi
if [[ -n "${REPLICAS:-}" ]]; then
    require_int 1 REPLICAS
    cmd+=(--ray --ray.replicas "$REPLICAS")
fi
cmd+=("${extra[@]}")

warn_if_exposed "${HOST:-}" R3RAG_RETRIEVER_API_KEY
if (( dry_run )); then
    print_command "${cmd[@]}"
    exit 0
fi
exec "${cmd[@]}"
