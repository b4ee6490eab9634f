"""Test vectors of the Python line-table decoder (src/symbolize/python_lines.rs): for every
code object of a sample module, its first line, its location table (co_linetable, hex) and
the line of each code unit (co_positions), printed as a JSON array. python_lines.json holds
the arrays of CPython 3.11.7, 3.12.1 and 3.13.0 concatenated, one vector per line:

    for v in 3.11.7 3.12.1 3.13.0; do /root/.pyenv/versions/$v/bin/python3 python_lines.py; done
"""
import json
import sys

GAP = "\n" * 150  # > 100 lines between statements: long-form entries

SAMPLE = (
    '''
def loops(n):
    total = 0
    for i in range(n):
        if i % 3:
            total += i
        else:
            total -= 1
    while n > 0:
        n -= 1
    return total

def multi_line_call(a, b):
    return dict(
        first=a,
        second=[
            b,
            a + b,
        ],
        third=sum(
            x for x in range(a)
        ),
    )

def comprehensions(xs):
    squares = [x * x for x in xs]
    evens = {x for x in xs if x % 2 == 0}
    table = {x: [y for y in range(x)] for x in xs}
    return squares, evens, table

def handlers(f):
    try:
        value = f()
    except ValueError as error:
        value = str(error)
    except (KeyError, IndexError):
        value = None
    finally:
        f = None
    with open("/dev/null") as sink:
        sink.read()
    return value

class Shape:
    sides = 0

    def area(self, w,
             h):
        return (w *
                h)

def far_apart():
    a = [1]'''
    + GAP
    + '''    b = a * 2'''
    + GAP
    + '''    return (a,'''
    + GAP
    + '''            b)

def far_back(n):
    while n:'''
    + GAP
    + '''        n -= 1
    return n

async def coroutine(x):
    await x
    return [y async for y in x]

def generator(n):
    yield from range(n)
    yield n
'''
)


def code_objects(code):
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_linetable"):
            yield from code_objects(const)


def main():
    version = "%d.%d.%d" % sys.version_info[:3]
    module = compile(SAMPLE, "sample.py", "exec")
    vectors = []
    for code in code_objects(module):
        lines = [position[0] for position in code.co_positions()]
        assert len(lines) * 2 == len(code.co_code)
        vectors.append(
            {
                "python": version,
                "qualname": code.co_qualname,
                "first_line": code.co_firstlineno,
                "line_table": code.co_linetable.hex(),
                "lines": lines,
            }
        )
    json.dump(vectors, sys.stdout)


if __name__ == "__main__":
    main()
