line="a:b:c"
IFS=: read -r x y z <<< "$line"
echo "$z $y $x"
