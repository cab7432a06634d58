#!/usr/bin/env bash
# Draws the dashboard's key panels from a real run: docs/img/dashboard/NAME.tsv
# (written by test/node TestWalkthrough with NODE_PROMETHEUS: the panel's
# queries from deploy/monitoring/dashboard.json, evaluated by Prometheus
# over the run) -> docs/img/dashboard-NAME.png, with gnuplot. Commit both.
# `make dashboard-images` runs the node and then this; `make docs-images`
# redraws from the committed data. Needs gnuplot (Debian: apt-get install
# gnuplot-nox; installed here when missing and run as root).
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v gnuplot >/dev/null; then
	if [[ $(id -u) != 0 ]]; then
		echo "docs/img: gnuplot is missing: apt-get install gnuplot-nox" >&2
		exit 1
	fi
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null
fi
shopt -s nullglob
files=(dashboard/*.tsv)
((${#files[@]})) || { echo "docs/img: no dashboard/*.tsv (make dashboard-images)" >&2; exit 1; }
for tsv in "${files[@]}"; do
	name=$(basename "$tsv" .tsv)
	title=$(sed -n 's/^# title: //p' "$tsv")
	unit=$(sed -n 's/^# unit: //p' "$tsv")
	IFS=$'\t' read -r -a header < <(grep -v '^#' "$tsv" | head -1)
	label() { # unit -> axis label and the factor the values are drawn at
		case $1 in
		s) echo "seconds|1" ;;
		percentunit) echo "share of the time (%)|100" ;;
		ops) echo "per second|1" ;;
		bytes) echo "MiB|1/1048576.0" ;;
		short | "") echo "|1" ;;
		*) echo "$1|1" ;;
		esac
	}
	IFS='|' read -r ylabel scale < <(label "$unit")
	y2=$(sed -n 's/^# y2: //p' "$tsv")
	y2unit=${y2%% *} y2re=${y2#* }
	IFS='|' read -r y2label y2scale < <(label "$y2unit")
	plots=() axis2=""
	for ((i = 1; i < ${#header[@]}; i++)); do
		col=$((i + 1)) name_i=${header[i]//\'/}
		if [[ -n $y2 && ${header[i]} =~ $y2re ]]; then
			plots+=("'$tsv' using 1:(column($col)*$y2scale) axes x1y2 with points pt 7 ps 0.45 title '$name_i ($y2label)'")
			axis2="set y2label '$y2label'; set y2tics; set y2range [0:*]; set ytics nomirror"
		else
			plots+=("'$tsv' using 1:(column($col)*$scale) with points pt 7 ps 0.45 title '$name_i'")
		fi
	done
	plot=$(IFS=,; echo "${plots[*]}")
	marks="" n=0
	while read -r at label; do
		n=$((n + 1)) y=1.03
		((n % 2)) || y=1.09 # alternate heights: close marks' labels do not overlap
		marks+="set arrow from $at, graph 0 to $at, graph 1 nohead dt 2 lc rgb '#888888'"$'\n'
		marks+="set label '$label' at $at, graph $y center font ',8' tc rgb '#555555'"$'\n'
	done < <(sed -n 's/^# mark: //p' "$tsv")
	gnuplot <<GP
set terminal pngcairo size 900,330 font 'sans,9'
set output 'dashboard-$name.png'
set datafile separator '\t'
set datafile missing 'NaN'
set title "$title" offset 0,1
set xlabel 'seconds into the run'
set ylabel '$ylabel'
$axis2
set yrange [0:*]
set xrange [0:*]
set key outside right top
set grid ytics lc rgb '#dddddd'
set tmargin 5
$marks
plot $plot
GP
	echo "docs/img: dashboard-$name.png from $tsv ($(gnuplot --version))"
done
