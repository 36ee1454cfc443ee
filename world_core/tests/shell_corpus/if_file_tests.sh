touch present
mkdir folder
[ -f present ] && echo file
[ -d folder ] && echo dir
[ -e missing ] || echo nofile
[ -s present ] || echo empty
