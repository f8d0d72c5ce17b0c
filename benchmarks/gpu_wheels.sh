#!/bin/bash
# The folder of wheels the GPU image lacks, built here (where PyPI is
# reachable) for the image's Python (CPython 3.12, manylinux x86_64):
#
#   bash benchmarks/gpu_wheels.sh          # writes .whl/ (git ignores it)
#
# The device call carries .whl and, before anything imports scalerl_jax,
# installs it over the image's packages (docs/gpu.md, set-up):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile \
#     --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site
#
# What goes in: setup.py's runtime requirements (its `_RUNTIME` list, read
# from the file, not repeated here), resolved by pip for that Python at
# the Python 3.12 line's tested versions ($CONSTRAINTS), with JAX pinned to
# the image's ($IMAGE_JAX); less JAX itself (the image's CUDA build stays)
# and less the packages the image already holds ($IMAGE_HAS). The
# packages setup.py bounds to a tested range (flax, optax, orbax-checkpoint,
# grain) are carried even where the image has them: its versions are not
# known to be in range. One version of each, so the folder is emptied first.
set -eu
# A Python 3.12, the image's line: pip's resolver checks JAX's
# requires-python (>=3.12 from 0.11 on) against the Python it runs in, even
# with --python-version (with pyenv: PYENV_VERSION=3.12.1).
PYTHON=${PYTHON:-python3.12}
WHL=${WHL:-.whl}
IMAGE_JAX=${IMAGE_JAX:-0.11.2}
# The tested environment of the image's Python line (constraints/).
CONSTRAINTS=${CONSTRAINTS:-constraints/python3.12_jax0.12.0.1.txt}
# The GPU image's packages that the resolved closure also names (the device
# tool's package list of its 'cuda' image). Carrying them would override the
# image's builds for nothing.
IMAGE_HAS=${IMAGE_HAS:-"absl-py aiofiles cloudpickle contourpy cycler etils \
fonttools fsspec humanize kiwisolver markdown-it-py matplotlib mdurl ml-dtypes \
msgpack numpy opt-einsum packaging pillow prometheus-client protobuf psutil \
pygments pyparsing python-dateutil pyyaml rich safetensors scipy sentencepiece \
simplejson tensorstore tqdm treescope typing-extensions uvloop zipp"}
# Left out: only a TFDS prompt source imports tensorflow-datasets
# (data/readers.py, at the source's start), and its dependency `promise`
# ships no wheel.
NOT_CARRIED=${NOT_CARRIED:-"tensorflow-datasets"}
PLATFORMS=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# setup.py's runtime requirements, JAX pinned to the image's; the bounded
# ones (a "<" in their range) are written to $work/bounded; $CONSTRAINTS
# less its JAX to $work/constraints.txt.
"$PYTHON" - "$work" "$IMAGE_JAX" "$NOT_CARRIED" "$CONSTRAINTS" <<'EOF'
import ast, re, sys
work, image_jax, not_carried = sys.argv[1], sys.argv[2], sys.argv[3].split()
constraints = sys.argv[4]
tree = ast.parse(open("setup.py").read())
runtime = next(
    ast.literal_eval(node.value) for node in tree.body
    if isinstance(node, ast.Assign)
    and getattr(node.targets[0], "id", "") == "_RUNTIME"
)
name = lambda req: re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0]
kept = [r for r in runtime if name(r) not in not_carried]
reqs = [f"jax=={image_jax}" if name(r) == "jax" else r for r in kept]
open(f"{work}/requirements.txt", "w").write("\n".join(reqs) + "\n")
bounded = [name(r) for r in kept if "<" in r and name(r) != "jax"]
open(f"{work}/bounded", "w").write("\n".join(bounded) + "\n")
pins = open(constraints).read().splitlines()
own = [p for p in pins if name(p).lower() not in ("jax", "jaxlib", "libtpu")]
open(f"{work}/constraints.txt", "w").write("\n".join(own) + "\n")
EOF

"$PYTHON" -m pip install --quiet --dry-run --ignore-installed \
  --target "$work/target" --report "$work/report.json" "${PLATFORMS[@]}" \
  -r "$work/requirements.txt" -c "$work/constraints.txt"

# The resolved name==version pins to carry.
"$PYTHON" - "$work" "$IMAGE_HAS" >"$work/pins" <<'EOF'
import json, re, sys
work, image_has = sys.argv[1], sys.argv[2].split()
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
bounded = {norm(n) for n in open(f"{work}/bounded").read().split()}
skip = {norm(n) for n in image_has} | {"jax", "jaxlib"}
for item in json.load(open(f"{work}/report.json"))["install"]:
  meta = item["metadata"]
  if norm(meta["name"]) in bounded or norm(meta["name"]) not in skip:
    print(f"{meta['name']}=={meta['version']}")
EOF

rm -rf "$WHL"
"$PYTHON" -m pip download --quiet --no-deps "${PLATFORMS[@]}" -d "$WHL" \
  -r "$work/pins"
ls -1 "$WHL"
echo "$(ls "$WHL" | wc -l) wheels, $(du -sh "$WHL" | cut -f1) in $WHL"
