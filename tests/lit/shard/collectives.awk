# One line per collective of an IR dump: phase, op, result type, axes.
match($0, / = (all_reduce|all_gather|reduce_scatter|all_to_all|shard_slice) /) {
    op = substr($0, RSTART + 3, RLENGTH - 4)
    phase = "fwd"
    if ($0 ~ / phase bwd/) phase = "bwd"
    if ($0 ~ / phase opt/) phase = "opt"
    type = $0; sub(/^[^:]*: /, "", type); sub(/ .*/, "", type)
    axes = $0; sub(/.*axes = \[/, "", axes); sub(/\].*/, "", axes); gsub(/"/, "", axes)
    print phase, op, type, axes
}
