total=0
add() { total=$((total + $1)); }
add 3; add 4
echo $total
