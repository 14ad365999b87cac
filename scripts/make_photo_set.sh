#!/usr/bin/env bash
# Builds the image benchmark set from the photographs of Debian's plasma-workspace-wallpapers (installed when
# missing): 20 classes, one per source picture (the package's 11 photographs and 9 of its rendered pictures), each
# 500 random 4:3 windows (35-100% of the largest, anywhere in the picture) resized to 500x375 and saved as JPEG
# quality 90: an ImageFolder of 8000 training and 2000 validation images (~0.5 GB) that is an ImageNet-like task on
# real image statistics ("which picture is this window from"). Deterministic from the seed. Also writes the
# full-size source pictures' list (OUT/sources.txt) for the full-size decode benchmark.
# usage: scripts/make_photo_set.sh [OUT=build/photo_set] [SEED=0] [EMBER_MAKE_IMAGES=build/tools/ember_make_images]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-build/photo_set} seed=${2:-0}
tool=${EMBER_MAKE_IMAGES:-build/tools/ember_make_images}
[ -x "$tool" ] || { echo "make_photo_set: $tool not found: build it (cmake --build build --target ember_make_images)" >&2; exit 2; }
walls=/usr/share/wallpapers
if [ ! -d "$walls/Path" ]; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends plasma-workspace-wallpapers
fi
# Photographs first, then rendered pictures with the texture of photographs (gradients, grain, shapes).
photos=(BytheWater ColdRipple ColorfulCups DarkestHour EveningGlow FallenLeaf Grey Kite OneStandsOut Path summer_1am)
rendered=(Altai Autumn Flow Honeywave MilkyWay PastelHills SafeLanding Shell Volna)
args=()
: >"$out.sources.tmp"
for name in "${photos[@]}" "${rendered[@]}"; do
  # The largest picture of the theme (by pixel count).
  best=$(ls "$walls/$name/contents/images/" | grep -E '^[0-9]+x[0-9]+\.(jpg|png)$' |
         awk -Fx '{split($2, h, "."); print $1 * h[1], $0}' | sort -n | tail -1 | cut -d' ' -f2)
  [ -n "$best" ] || { echo "make_photo_set: no picture in $walls/$name" >&2; exit 1; }
  args+=("$name=$walls/$name/contents/images/$best")
  echo "$walls/$name/contents/images/$best" >>"$out.sources.tmp"
done
rm -rf "$out"
mkdir -p "$out"
mv "$out.sources.tmp" "$out/sources.txt"
"$tool" windows "$out" --seed "$seed" --per-class 500 --size 500x375 --quality 90 --val-every 5 "${args[@]}"
echo "make_photo_set: $(find "$out/train" -name '*.jpg' | wc -l) training and $(find "$out/val" -name '*.jpg' | wc -l) validation images in $out ($(du -sh "$out" | cut -f1))"
