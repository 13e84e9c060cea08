#!/usr/bin/env bash
# format.sh: clang-format over the project's own C sources (not build/).
#   format.sh check   list the files that differ from .clang-format; exit 1 if any
#   format.sh fix     rewrite them in place
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=${1:-check}
mapfile -t files < <(find . \( -path ./build -o -path ./.git -o -path ./shared \) -prune \
    -o \( -name '*.c' -o -name '*.h' \) -type f -print | sed 's|^\./||' | sort)

if [ "$mode" = fix ]; then
    clang-format --style=file -i "${files[@]}"
    echo "format: ${#files[@]} files formatted"
    exit 0
fi

bad=0
for f in "${files[@]}"; do
    # Changed lines between the file and its formatted form.
    n=$(clang-format --style=file "$f" | diff "$f" - | grep -c '^<' || true)
    if [ "$n" -ne 0 ]; then
        echo "format-check: $f: $n lines differ from .clang-format"
        bad=$((bad + 1))
    fi
done
if [ "$bad" -ne 0 ]; then
    echo "format-check: $bad of ${#files[@]} files need formatting (make format fixes them)"
    exit 1
fi
echo "format-check: ${#files[@]} files clean"
