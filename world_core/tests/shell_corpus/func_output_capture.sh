double() { echo $(( $1 * 2 )); }
r=$(double 21)
echo "result $r"
