printf 'a\nb\n' | jq -R -c '[., length]'
printf '1\n2\n3\n' | jq -s 'add'
