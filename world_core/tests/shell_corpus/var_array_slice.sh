arr=(a b c d e)
echo "${arr[@]:1:3}"
