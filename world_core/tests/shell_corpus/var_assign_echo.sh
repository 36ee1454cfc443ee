a=1
b="two words"
echo "$a $b"
