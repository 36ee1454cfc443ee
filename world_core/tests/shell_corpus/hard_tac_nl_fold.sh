printf 'a\nb\nc\n' | tac
printf 'x\ny\n' | nl
echo 'abcdefghij' | fold -w 4
