count=0
printf 'a\nb\n' | while read -r _; do count=$((count+1)); done
echo "pipe $count"
while read -r _; do count=$((count+1)); done < <(printf 'a\nb\n')
echo "procsub $count"
