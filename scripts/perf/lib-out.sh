# Sourced by device-call scripts: the device tool returns at most 8 files from $OUT (docs: /work/.library/device), and
# call s36-1 lost three logs to that limit. out_bundle KEEP...: leaves the files named KEEP (basenames in $OUT, at
# most 7) as they are and packs every other file of $OUT into one $OUT/bundle-<first kept's prefix>.tar.xz, so that
# at most 8 files come back. Run it last.
out_bundle() {
  local keep=" $* " rest=() f b
  for f in "$OUT"/*; do
    [ -f "$f" ] || continue
    b=$(basename "$f")
    case "$keep" in *" $b "*) ;; *) rest+=("$b") ;; esac
  done
  [ ${#rest[@]} -eq 0 ] && return 0
  local name="bundle-${1%%.*}.tar.xz"
  ( cd "$OUT" && tar -cJf "$name" "${rest[@]}" && rm -f "${rest[@]}" )
  echo "out_bundle: ${#rest[@]} files in $name"
}
