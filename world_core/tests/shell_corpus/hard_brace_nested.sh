echo {a,b}{1,2}
echo pre-{x,y{1,2}}-post
