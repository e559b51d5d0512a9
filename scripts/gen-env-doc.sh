#!/usr/bin/env bash
# Regenerate the tunables table of docs/environment.md from mlxdist-info.
#   usage: scripts/gen-env-doc.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
doc=$root/docs/environment.md
head=$(sed -n '1,/^| Variable | Default/p' "$doc" | sed '$d')
{ printf '%s\n' "$head"; "$1/tools/mlxdist-info" --env --markdown; } > "$doc.tmp"
mv "$doc.tmp" "$doc"
