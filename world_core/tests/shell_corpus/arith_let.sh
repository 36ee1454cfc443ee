let x=5*3
echo $x
