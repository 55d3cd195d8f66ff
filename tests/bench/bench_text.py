"""Plain English text for the CPU benchmark (tests/bench/bench_cpu.py).

A few paragraphs of varied prose on unrelated topics. `document(n_chars)`
strings them together in a different (seeded) order each round, so a long
document is real text rather than one repeated sentence or token.
"""
import random

PARAGRAPHS = [
    "The printing press arrived in Mainz in the middle of the fifteenth century, and within fifty years "
    "there were presses in more than two hundred European towns. Printers were craftsmen and merchants at "
    "once: they bought paper on credit, cast their own type from lead, tin and antimony, and gambled on "
    "which books would sell. Bibles and grammars were safe bets, while almanacs, sermons and cheap "
    "pamphlets paid the rent. Scholars complained that the new books were full of errors, yet they bought "
    "them anyway, because a printed text could be checked against another copy that was exactly the same.",

    "A honeybee colony in summer holds perhaps forty thousand workers, a few hundred drones and a single "
    "queen. Foragers that find a rich patch of flowers return to the hive and perform a waggle dance on the "
    "vertical comb: the angle of the run tells their sisters the direction of the food relative to the "
    "sun, and its length tells them how far away it lies. Because the sun moves during the day, the "
    "dancers slowly rotate their runs to keep the message accurate, a correction no one taught them.",

    "Before you start the bread, weigh the flour rather than measuring it in cups, since a cup of flour "
    "can vary by a fifth depending on how firmly it was packed. Mix the water and yeast first, then add "
    "the flour and salt, and leave the shaggy dough covered for half an hour. Stretch and fold it four "
    "times over the next two hours. When it has nearly doubled, shape it gently, let it rise once more in "
    "a floured basket, and bake it in a very hot covered pot for twenty minutes before removing the lid.",

    "Volcanic eruptions differ mainly in how easily gas escapes from the rising magma. Runny basalt, poor "
    "in silica, lets bubbles slip out, so Hawaiian volcanoes pour lava in fountains and rivers that can be "
    "watched from a safe distance. Sticky, silica-rich magma traps the gas until the pressure shatters it "
    "into ash and pumice, which is why the eruption of Vesuvius in the year 79 buried Pompeii under "
    "several metres of debris in less than a day, preserving bread in ovens and graffiti on the walls.",

    "The committee met on a Tuesday to discuss the budget for the new library wing. Mrs. Alvarez argued "
    "that the reading room needed more natural light, while the treasurer warned that large windows would "
    "raise the heating bill every winter. After an hour of debate they agreed on a compromise: tall "
    "windows facing north, a modest skylight above the children's corner, and a promise to revisit the "
    "question once the architect had produced two or three drawings with real numbers attached.",

    "Jazz grew up in New Orleans at the start of the twentieth century, where brass bands, ragtime piano, "
    "church music and the blues met in the same streets and dance halls. Early ensembles improvised "
    "together, each instrument weaving its own line around the melody. Later, in Chicago and New York, "
    "the soloist stepped forward: a trumpeter or saxophonist would invent a new tune over the chords of a "
    "familiar song, and the audience listened for how boldly he could bend the rules without breaking them.",

    "Coral reefs cover less than one percent of the ocean floor, yet they shelter roughly a quarter of all "
    "marine species. The reef itself is built by tiny animals, the coral polyps, which live in partnership "
    "with microscopic algae. The algae turn sunlight into sugar and share it with their hosts, and the "
    "polyps in return offer shelter and nutrients. When the water grows too warm for too long, the "
    "partnership breaks down, the algae are expelled, and the bleached coral begins to starve.",

    "Train travel across a continent teaches patience. The sleeper car rocks steadily through the night, "
    "and at dawn the window shows a different country: wheat fields instead of forest, a river wide "
    "enough to look like a lake, a station platform where an old man sells apricots from a cardboard box. "
    "Meals are taken with strangers, who turn out to be a retired teacher, a student going home for the "
    "holidays and an engineer who explains, at length, how the bogies are changed at the border.",

    "In chess, the opening is a race to develop pieces and claim the centre, but the middle game is where "
    "most games are decided. A player who understands pawn structure can often tell which plans make "
    "sense long before any tactics appear on the board. An isolated pawn on an open file, for example, is "
    "a weakness in the endgame and a source of active piece play in the middle game, so the side that "
    "owns it usually wants to attack early, while the opponent tries to trade pieces and wait.",

    "Thunderstorms form when warm, moist air rises quickly into colder air above it. As the air climbs, "
    "its water vapour condenses, releasing heat that drives the updraft even higher, sometimes to the top "
    "of the troposphere, where the cloud spreads into a flat anvil. Inside the cloud, collisions between "
    "ice crystals and soft hail separate electric charge. When the difference becomes large enough, a "
    "lightning stroke heats a narrow channel of air to several times the temperature of the sun's surface.",

    "Economists have long argued about why some cities grow while others decline. One explanation points "
    "to the advantages of clustering: firms near one another share suppliers, hire from a common pool of "
    "skilled workers, and learn from each other's mistakes. Another stresses geography, such as a good "
    "harbour or a river crossing, that gave a place its first start. Most researchers now think both "
    "matter, and that an early accident of location can be locked in for centuries by later investment.",

    "The old lighthouse keeper kept a logbook for forty-one years. Most entries are short: the direction "
    "of the wind, the state of the sea, the hours the lamp was lit, the number of gallons of oil it burned. "
    "But between the routine lines there are small stories. A storm in 1913 tore the door from its hinges; "
    "a seal slept on the landing for three days in March; a ship's boy rowed across in fog to deliver a "
    "letter and a jar of marmalade, and stayed for supper because the tide had turned against him.",

    "Learning a second language as an adult is slower than it is for a child, but adults have advantages "
    "too. They can read grammar explanations, keep a vocabulary notebook, and plan regular practice. "
    "Researchers recommend spaced repetition for new words, listening to material that is slightly above "
    "one's current level, and speaking early even when it feels embarrassing. Mistakes are not a sign of "
    "failure; they show which rules the learner is testing, and each correction makes the next guess better.",

    "Deserts are not empty. In the hours after a rare rain, seeds that have waited years in the sand "
    "germinate, flower and set new seed within a few weeks. Beetles collect fog on their backs and tilt "
    "their bodies so the droplets run down into their mouths. Kangaroo rats never drink at all, getting "
    "the water they need from the dry seeds they eat, and they lose very little of it, because their "
    "kidneys produce urine several times more concentrated than that of any human being.",
]


def document(n_chars, seed=0):
    """Text of at least n_chars characters: rounds of all paragraphs, each
    round in its own shuffled order."""
    rng = random.Random(seed)
    out, size, rnd = [], 0, 0
    while size < n_chars:
        order = list(range(len(PARAGRAPHS)))
        rng.shuffle(order)
        for i in order:
            out.append(PARAGRAPHS[i])
            size += len(PARAGRAPHS[i]) + 2
        rnd += 1
    return "\n\n".join(out) + "\n"
