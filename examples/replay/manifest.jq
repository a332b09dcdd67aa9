# manifest.json (mlconf fixtures v2) -> one tab-separated line per case for replay.c:
#   id  area  op  compare  args  inputs  outputs  expect
# args: key=value ...; inputs / outputs: name=FILE[:DTYPE:SHAPE][!SPECIAL] ... (SHAPE as 2x128);
# expect: status=S rule=R refused_after_rows=N statuses=S ... nmse=X max_abs=X max_ulp=X argmax=X cosine=X
def shape: map(tostring) | join("x");
def file: .file + (if .dtype then ":\(.dtype):\(.shape | shape)" else "" end)
               + (if .special then "!\(.special)" else "" end);
.cases[]
| [ .id, .area, .op, .expect.compare,
    ([.args | to_entries[] | "\(.key)=\(.value)"] | join(" ")),
    ([.inputs | to_entries[] | "\(.key)=\(.value | file)"] | join(" ")),
    ([(.expect.outputs // {}) | to_entries[] | "\(.key)=\(.value | file)"] | join(" ")),
    ([.expect | to_entries[] | select(.key == "status" or .key == "rule" or .key == "refused_after_rows") | "\(.key)=\(.value)"]
     + [(.expect.statuses // [])[] | "statuses=\(.)"]
     + [(.expect.tolerance // {}) | to_entries[] | select(.key != "name") | "\(.key)=\(.value)"]
     | join(" ")) ]
| @tsv
