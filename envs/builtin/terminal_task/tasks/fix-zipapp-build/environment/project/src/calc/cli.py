import sys

from calc.ops import add, mul


def run():
    op, *args = sys.argv[1:]
    values = [int(a) for a in args]
    print({"add": add, "mul": mul}[op](values))
