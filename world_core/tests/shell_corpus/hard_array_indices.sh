arr=(a b c)
unset 'arr[1]'
echo "${!arr[@]}" "${#arr[@]}"
