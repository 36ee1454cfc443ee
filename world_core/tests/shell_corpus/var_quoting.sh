v='a   b'
echo $v
echo "$v"
echo '$v'
