# Sourced by the GPU scripts that run flash-linear-attention 0.6 beside our
# kernels: unpacks its wheels (carried in .whl/) into /tmp/fla and points
# PYTHONPATH there, and keeps Triton's compiled kernels and autotuning
# results in .fla-cache/ at the repository's root (git-ignored). fla compiles
# its Triton kernels on first use: in sessions 44 and 45 its GDN rows took
# most of 150 s and its KDA produced no row in 200 s. Carry .fla-cache (with
# .whl) and a later call starts warm: save_fla_cache OUTDIR packs it into
# OUTDIR/fla-cache.tgz (under the device tool's 16 MiB a file), and
# `mkdir -p .fla-cache && tar -xzf fla-cache.tgz -C .fla-cache` here restores it.
FLA_ROOT=$(pwd)
mkdir -p /tmp/fla "$FLA_ROOT/.fla-cache/triton"
for w in "$FLA_ROOT"/.whl/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/fla; done
export PYTHONPATH=/tmp/fla${PYTHONPATH:+:$PYTHONPATH}
export TRITON_CACHE_DIR="$FLA_ROOT/.fla-cache/triton" TRITON_CACHE_AUTOTUNING=1

# save_fla_cache OUTDIR: the Triton cache as OUTDIR/fla-cache.tgz, when it
# packs under 16 MiB (the device tool's limit on a returned file).
save_fla_cache() {
  tar -czf "$1/fla-cache.tgz" -C "$FLA_ROOT/.fla-cache" . 2>/dev/null
  local bytes=$(stat -c %s "$1/fla-cache.tgz" 2>/dev/null || echo 0)
  if [ "$bytes" -gt 16000000 ]; then
    rm -f "$1/fla-cache.tgz"; echo "-- fla cache: $bytes bytes packed, over 16 MB: not returned"
  else
    echo "-- fla cache: $bytes bytes in $1/fla-cache.tgz"
  fi
}
