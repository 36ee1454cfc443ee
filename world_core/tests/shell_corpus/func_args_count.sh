count() { echo "$#"; }
count a b c
count
count "a b"
