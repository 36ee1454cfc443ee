n=5
n=$((n + 1))
((n++))
echo "$n"
