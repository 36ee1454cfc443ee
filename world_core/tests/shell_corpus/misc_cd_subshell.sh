mkdir -p deep/er
( cd deep/er && touch marker )
ls deep/er
