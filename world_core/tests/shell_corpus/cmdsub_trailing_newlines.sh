v=$(printf 'a\n\n\n')
echo "[$v]"
