d=$(mktemp -d -p .)
[ -d "$d" ] && echo dir-made
rm -rf "$d"
ls | wc -l
