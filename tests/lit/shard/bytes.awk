# Bytes one device sends per step, from an IR dump: the count and the bytes of
# each kind of collective over tensors (rank >= 1), then their total, then the
# total over scalars (the loss, a gradient norm's sum of squares).
match($0, / = (all_reduce|all_gather|reduce_scatter|all_to_all) /) {
    op = substr($0, RSTART + 3, RLENGTH - 4)
    b = $0; sub(/.*bytes = /, "", b); sub(/[^0-9].*/, "", b)
    type = $0; sub(/^[^:]*: /, "", type); sub(/ .*/, "", type)
    if (type ~ /\[\]$/) { scalars += b; next }
    n[op]++; bytes[op] += b; total += b
}
END {
    split("all_reduce reduce_scatter all_gather all_to_all", ops, " ")
    for (i = 1; i <= 4; i++)
        if (n[ops[i]]) print ops[i], n[ops[i]], "x", bytes[ops[i]], "bytes"
    print "tensors", total + 0, "bytes"
    print "scalars", scalars + 0, "bytes"
}
