#!/usr/bin/env bash
# Renders the pictures under docs/img from their Graphviz sources:
# docs/img/NAME.dot -> docs/img/NAME.png (`make docs-images`). Commit both.
# Needs Graphviz's dot (Debian: apt-get install graphviz; installed here
# when missing and run as root, as the other make targets install tools).
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v dot >/dev/null; then
	if [[ $(id -u) != 0 ]]; then
		echo "docs/img: dot is missing: apt-get install graphviz" >&2
		exit 1
	fi
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends graphviz >/dev/null
fi
for src in *.dot; do
	dot -Tpng -Gdpi=110 "$src" -o "${src%.dot}.png"
	echo "docs/img: ${src%.dot}.png from $src ($(dot -V 2>&1))"
done
