#!/bin/bash
set -euo pipefail
find /app/photos -type f -name 'IMG_*' | while read -r f; do
  dir=$(dirname "$f"); base=$(basename "$f")
  digits=${base#IMG_}; digits=${digits%%.*}
  ext=$(echo "${base##*.}" | tr 'A-Z' 'a-z'); [ "$ext" = jpeg ] && ext=jpg
  mv "$f" "$dir/img-$digits.$ext"
done
