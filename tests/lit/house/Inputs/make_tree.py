"""make_tree.py DIR: a small tree with one breach of each kind the house's
checker finds, and its objects under DIR/obj (compiled with cc)."""
import os
import subprocess
import sys

FILES = {
    # two files that call each other
    'passes/a.c': 'int b(void);\nint a(void)\n{\n    return b();\n}\n',
    'passes/b.c': 'int a(void);\nint b(void)\n{\n    return a();\n}\n',
    # a lower floor that includes and calls a higher one
    'ir/low.c': '#include "passes/p.h"\nint p(void);\nint low(void)\n{\n    return p();\n}\n',
    'passes/p.c': 'int p(void)\n{\n    return 1;\n}\n',
    # two files of one name
    'codegen/p.c': 'int cp(void)\n{\n    return 2;\n}\n',
    # two headers that include each other (guarded)
    'passes/p.h': '#ifndef P_H\n#define P_H\n#include "passes/q.h"\n#endif\n',
    'passes/q.h': '#ifndef Q_H\n#define Q_H\n#include "passes/p.h"\n#endif\n',
    # a function of 136 lines; a file of 1300
    'codegen/big.c': 'int long_one(void)\n{\n    int x = 0;\n' + '    x++;\n' * 131 + '    return x;\n}\n',
    'codegen/wide.c': ''.join('int f%d(void) { return %d; }\n' % (i, i) for i in range(1300)),
}

root = sys.argv[1]
for path, text in FILES.items():
    os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
    with open(os.path.join(root, path), 'w') as f:
        f.write(text)
for path in FILES:
    if path.endswith('.c'):
        obj = os.path.join(root, 'obj', path[:-2] + '.o')
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        subprocess.run(['cc', '-w', '-I', root, '-c', '-o', obj, os.path.join(root, path)],
                       check=True)
