touch 'a*b' ab
echo "a*b"
ls
