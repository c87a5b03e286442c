# Sourced by the GPU scripts that run flash-linear-attention 0.6 beside our
# kernels: unpacks its wheels (carried in .whl/) into /tmp/fla and points
# PYTHONPATH there, and keeps Triton's compiled kernels and autotuning
# results in .fla-cache/ at the repository's root (git-ignored). fla compiles
# its Triton kernels on first use: in sessions 44 and 45 its GDN rows took
# most of 150 s and its KDA produced no row in 200 s. Carry .fla-cache (with
# .whl) and a later call starts warm: save_fla_cache OUTDIR packs it into
# OUTDIR/fla-cache.tgz.part-* (15 MB each, under the device tool's 16 MiB
# a file). Copied here into .fla-cache-parts/ (git-ignored) and carried,
# the parts are unpacked below: the packed cache fits the 64 MiB a call may
# carry where the unpacked one may not.
FLA_ROOT=$(pwd)
mkdir -p /tmp/fla "$FLA_ROOT/.fla-cache/triton"
if ls "$FLA_ROOT"/.fla-cache-parts/fla-cache.tgz.part-* > /dev/null 2>&1; then
  cat "$FLA_ROOT"/.fla-cache-parts/fla-cache.tgz.part-* | tar -xz -C "$FLA_ROOT/.fla-cache" ||
    echo "-- fla cache: the carried parts did not unpack; fla compiles from scratch"
fi
for w in "$FLA_ROOT"/.whl/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/fla; done
export PYTHONPATH=/tmp/fla${PYTHONPATH:+:$PYTHONPATH}
export TRITON_CACHE_DIR="$FLA_ROOT/.fla-cache/triton" TRITON_CACHE_AUTOTUNING=1

# save_fla_cache OUTDIR: the Triton cache as OUTDIR/fla-cache.tgz.part-aa,
# -ab, ... (15 MB each: the device tool returns files up to 16 MiB; session
# 46's cache packed to 25.5 MB). For the next call, here:
# `mkdir -p .fla-cache-parts && cp FILES_AT/fla-cache.tgz.part-* .fla-cache-parts/`
# and carry .fla-cache-parts with .whl.
save_fla_cache() {
  tar -czf - -C "$FLA_ROOT/.fla-cache" . 2>/dev/null | split -b 15000000 - "$1/fla-cache.tgz.part-"
  echo "-- fla cache: $(cat "$1"/fla-cache.tgz.part-* | wc -c) bytes in $(ls "$1"/fla-cache.tgz.part-* | wc -l) parts"
}
