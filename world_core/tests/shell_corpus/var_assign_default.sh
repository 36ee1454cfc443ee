unset y
echo "${y:=assigned}"
echo "$y"
