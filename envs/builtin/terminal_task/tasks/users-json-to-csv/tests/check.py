import csv
import sys
from pathlib import Path

EXPECTED = [
    ["id", "name", "city", "active"],
    ["3", "Grace Hopper", "New York", "no"],
    ["8", 'Katherine "Kay" McNulty', "", "yes"],
    ["17", "Ada Lovelace", "London", "yes"],
    ["25", "Edsger Dijkstra", "Nuenen", "no"],
    ["42", "Alan Turing", "Wilmslow, Cheshire", "yes"],
]
try:
    rows = list(csv.reader(Path("/app/users.csv").read_text().splitlines()))
except OSError as e:
    sys.exit(f"cannot read /app/users.csv: {e}")
if rows != EXPECTED:
    sys.exit(f"rows {rows} != {EXPECTED}")
