v=`echo back`
echo $v
