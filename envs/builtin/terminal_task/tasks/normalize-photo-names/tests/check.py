import os
import sys
from pathlib import Path

EXPECTED = {
    "img-0001.jpg": "jpeg 0001\n", "img-0002.jpg": "jpeg 0002\n", "img-0017.jpg": "jpeg 0017\n",
    "img-0120.jpg": "jpeg 0120\n", "img-0002.cr2": "raw 0002\n",
    "trip/img-0300.jpg": "jpeg 0300\n", "README.txt": "keep\n",
}
found = {}
for root, _, files in os.walk("/app/photos"):
    for name in files:
        path = os.path.join(root, name)
        found[os.path.relpath(path, "/app/photos")] = Path(path).read_text()
if found != EXPECTED:
    sys.exit(f"files: {sorted(found)} expected {sorted(EXPECTED)} (or contents differ)")
