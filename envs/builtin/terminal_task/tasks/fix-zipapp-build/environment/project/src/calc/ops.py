def add(values):
    return sum(values)


def mul(values)
    result = 1
    for v in values:
        result *= v
    return result
