printf '# header\nx=1\n\ny=2\n' > cfg
while IFS='=' read -r key value; do
  [[ -z $key || $key == \#* ]] && continue
  echo "$key -> $value"
done < cfg
