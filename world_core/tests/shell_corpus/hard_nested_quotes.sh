x="a \"quoted\" 'mixed' string"
echo "$x"
eval "y=\"$x\""
echo "${#y}"
