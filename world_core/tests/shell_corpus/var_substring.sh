s="abcdefgh"
echo "${s:2}" "${s:2:3}" "${s: -3}"
