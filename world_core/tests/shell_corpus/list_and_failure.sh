false && echo yes
echo "after $?"
