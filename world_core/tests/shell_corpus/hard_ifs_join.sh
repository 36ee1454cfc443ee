arr=(a b c)
(IFS=,; echo "${arr[*]}")
