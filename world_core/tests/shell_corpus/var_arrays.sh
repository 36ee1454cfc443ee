arr=(red green blue)
echo "${arr[1]}" "${#arr[@]}"
arr+=(yellow)
echo "${arr[@]}"
for c in "${arr[@]}"; do echo "- $c"; done
