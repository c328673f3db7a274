#!/usr/bin/env bash
# Regenerates duet-hip's committed HIP runtime / hiprtc bindings with bindgen.
#
#   scripts/hip/bindgen.sh           # regenerate and overwrite the committed files
#   scripts/hip/bindgen.sh --check   # regenerate and fail if the committed files differ
#
# Needs the HIP headers ($ROCM_PATH/include, /opt/rocm/include or /usr/include; on Debian 12:
# `apt-get install libamdhip64-dev`) and libclang (`apt-get install libclang-dev`). It runs the
# opt-in build step of crates/hip/build.rs:
#   DUET_HIP_BINDGEN=1 cargo build -p duet-hip --features bindgen
# which writes hip_sys.rs / hiprtc_sys.rs into the build script's OUT_DIR, then copies them to
#   crates/hip/src/hip/sys/bindings.rs and crates/hip/src/hiprtc/sys/bindings.rs.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-write}
out_dir=$(DUET_HIP_BINDGEN=1 cargo build -p duet-hip --features bindgen --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "build-script-executed" and "duet-hip" in m.get("package_id", "") \
            and "duet_hip_bindgen" in m.get("cfgs", []):
        print(m["out_dir"])
')
if [ -z "$out_dir" ]; then
  echo "bindgen did not run (are the HIP headers and libclang installed?)" >&2
  exit 2
fi
status=0
for lib in hip hiprtc; do
  src="$out_dir/${lib}_sys.rs"
  dst="crates/hip/src/$lib/sys/bindings.rs"
  if [ "$mode" = "--check" ]; then
    if ! diff -u "$dst" "$src"; then
      echo "$dst is out of date: run scripts/hip/bindgen.sh" >&2
      status=1
    fi
  else
    cp "$src" "$dst"
    echo "wrote $dst"
  fi
done
exit $status
