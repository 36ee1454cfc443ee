declare -i num=4
num+=3
echo $num
