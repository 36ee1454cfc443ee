for w in alpha beta gamma; do echo "word $w"; done
