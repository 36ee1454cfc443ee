echo data | tee a b > /dev/null
cat a b
