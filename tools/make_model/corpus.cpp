// The text strata-make-model learns its BPE merges from: plain English in several registers (prose,
// dialogue, letters, recipes, facts), code (Python, C++, SQL, shell) and JSON, so ordinary words, chat
// phrases and common programming tokens become single tokens.
#include "corpus.hpp"

namespace strata::make_model {

std::string_view training_corpus() {
    return R"corpus(Hello! How are you today? I am fine, thank you. What would you like to talk about?
Hello there. Can you help me with a question? Of course, I would be happy to help. Please tell me more.
Thank you very much for your help. You are welcome. Is there anything else I can do for you?
Good morning. Good afternoon. Good evening. Good night, and sleep well.

The river ran quietly past the old mill, where the water wheel had not turned for many years. In the
spring the banks were covered with yellow flowers, and children from the village came down to watch the
fish jump in the shallow pools. Their parents warned them about the current, but the children knew every
stone and every branch, and nobody ever fell in. In the summer the river grew slow and warm, and in the
autumn the leaves floated down it like small boats carrying letters to the sea.

A computer is a machine that follows instructions. Each instruction is simple: add two numbers, compare
two values, move a piece of data from one place to another. The power of a computer comes from doing
billions of these simple steps every second, without getting tired and without making mistakes. Memory
holds the data and the program, and the processor reads both. When the memory is far away from the
processor, every step has to wait, which is why modern machines keep the most useful data close by.

Large language models predict the next word of a text. They read the words that came before, turn each
word into a list of numbers, and pass those numbers through many layers. Each layer mixes information
between the words with attention and then transforms each word on its own with a feed forward network.
In a mixture of experts, the feed forward network is split into many experts, and a small router picks
only a few of them for every word. This keeps the model large but the work per word small.

The weather today is sunny with a light wind from the west. Tomorrow will be cloudy, and rain is likely
in the evening. The temperature will stay between twelve and eighteen degrees. On Sunday the sky should
clear again, and the week will start warm and dry.

Question: What is the capital of France? Answer: The capital of France is Paris.
Question: How many days are in a week? Answer: There are seven days in a week.
Question: What is two plus three? Answer: Two plus three is five.
Question: Why is the sky blue? Answer: Sunlight is scattered by the air, and blue light is scattered the
most, so the sky looks blue when we look away from the sun.

She opened the door and saw a small dog sitting on the step. It looked up at her with bright eyes and
wagged its tail. "Where did you come from?" she asked. The dog did not answer, of course, but it followed
her into the kitchen and lay down next to the warm stove as if it had always lived there. By the end of
the week it had a name, a bowl and a blanket, and everyone in the house agreed that it was the best dog
in the whole town.

To make bread, mix flour, water, salt and yeast in a large bowl. Knead the dough for ten minutes until it
is smooth, then let it rise in a warm place for about one hour. Shape the loaf, let it rise again, and
bake it in a hot oven for thirty to forty minutes. The bread is ready when it sounds hollow as you tap the
bottom. Let it cool before you cut it.

The numbers 0 1 2 3 4 5 6 7 8 9 10 11 12 20 25 50 64 100 128 256 512 1000 1024 2048 4096 and 2026 appear
in dates, prices and sizes. The meeting starts at 9:30 and ends at 11:45. The price is 19.99 dollars, or
about 18 euros. Version 3.2.1 was released on 2025-06-14. The file is 1.5 GB, and the test took 42 ms.

def add(a, b):
    return a + b

for i in range(10):
    print(i * i)

int main(int argc, char** argv) {
    std::vector<int> values = {1, 2, 3};
    for (int v : values) total += v;
    return 0;
}

if (x > 0 && y < 10) { result = x * y; } else { result = -1; }
{"name": "strata", "version": "0.1.0", "tokens": [1, 2, 3], "ok": true}

Once upon a time there was a king who had three daughters. The youngest was the kindest, and the king
loved her most of all. One day a stranger arrived at the castle with a golden bird in a cage. He said the
bird could sing any song in the world, but it would sing only for someone with a true heart. The two
older sisters tried, and the bird stayed silent. When the youngest daughter came near, it began to sing
so beautifully that the whole court stood still and listened.

Learning a new language takes time and patience. Start with the most common words, listen to native
speakers, and practice a little every day. Do not be afraid of making mistakes; they are part of
learning. Read simple books, watch films with subtitles, and try to think in the new language. After a
few months you will notice that you understand much more than you expected.

The history of the city goes back more than two thousand years. It was founded as a small trading post
on the river, grew into a market town, and became the capital of the region in the middle ages. The old
walls still stand in some places, and the cathedral in the main square took almost two hundred years to
build. Today the city is known for its university, its museums and its long summer festivals.

Please write a short poem about the sea. The sea is wide, the sea is deep, it sings the sailors off to
sleep; it keeps the secrets of the past and holds the ships from first to last.

Can you explain how a bicycle works? When you push the pedals, the chain turns the back wheel, and the
bicycle moves forward. The gears change how far the wheel turns for each push, so you can climb hills
slowly or ride fast on flat roads. You steer with the handlebars and stop with the brakes.

I think the answer is yes, but I am not sure. Let me check and get back to you. Yes, that is correct.
No, I do not think so. Maybe later. Sorry, I do not know. That is a good question. Let us think about it
step by step. First, we read the problem. Second, we write down what we know. Third, we solve it.

Dear team, the quarterly report is attached. Revenue grew in every region except the north, where two
large customers delayed their orders until January. Please review the figures before Thursday's meeting
and send questions to Maria or Daniel. Kind regards, Jonathan.

Recipe: pancakes for four people. Mix two cups of flour, one spoonful of sugar, a pinch of salt and two
teaspoons of baking powder. Whisk the eggs with milk and melted butter, then pour the liquid into the dry
ingredients and stir gently. Heat a frying pan, add a little oil, and cook each pancake until bubbles
appear on the surface. Flip it once, serve warm with honey, berries, or lemon juice.

def fibonacci(n):
    """Return the first n Fibonacci numbers as a list."""
    result = []
    a, b = 0, 1
    while len(result) < n:
        result.append(a)
        a, b = b, a + b
    return result

for index, value in enumerate(fibonacci(10)):
    print(f"{index}: {value}")

import json
with open("config.json", encoding="utf-8") as handle:
    settings = json.load(handle)
if settings.get("verbose", False):
    logger.debug("loaded %d settings from %s", len(settings), handle.name)

#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    std::vector<std::string> arguments(argv + 1, argv + argc);
    for (const auto& argument : arguments) {
        std::cout << "argument: " << argument << std::endl;
    }
    return arguments.empty() ? 1 : 0;
}

class Account {
public:
    explicit Account(double balance) : balance_(balance) {}
    void deposit(double amount) { balance_ += amount; }
    bool withdraw(double amount) {
        if (amount > balance_) return false;
        balance_ -= amount;
        return true;
    }
private:
    double balance_;
};

SELECT customer_id, COUNT(*) AS orders, SUM(total) AS revenue
FROM purchases
WHERE created_at >= '2024-01-01'
GROUP BY customer_id
ORDER BY revenue DESC
LIMIT 20;

{"id": "chatcmpl-42", "object": "chat.completion", "model": "strata", "choices": [{"index": 0,
"message": {"role": "assistant", "content": "Sure, here is a short summary."}, "finish_reason": "stop"}],
"usage": {"prompt_tokens": 17, "completion_tokens": 9, "total_tokens": 26}}
{"name": "Alice", "age": 34, "email": "alice@example.com", "languages": ["English", "Spanish"], "active": true}
{"city": "Berlin", "country": "Germany", "population": 3645000, "timezone": "Europe/Berlin", "coordinates": {"latitude": 52.52, "longitude": 13.405}}

$ git status
On branch main
Your branch is up to date with 'origin/main'.
$ ls -la /var/log
$ sudo systemctl restart nginx
$ curl -s https://example.com/api/v1/users?page=2 | jq '.items[] | .username'
Error: connection refused. Check that the server is running and listening on port 8080.
Warning: the configuration file is deprecated; please migrate to the new format.

History: The printing press, invented around 1440, changed how knowledge travelled. Before it, monks
copied books by hand, slowly and expensively. Afterwards, pamphlets, newspapers and scientific journals
spread ideas across Europe within weeks. Literacy increased, universities multiplied, and governments
struggled to control what people read.

Science: Photosynthesis converts sunlight, water and carbon dioxide into glucose and oxygen. It happens
inside chloroplasts, which contain the green pigment chlorophyll. Plants, algae and some bacteria depend
on this process, and nearly every animal depends on plants, directly or indirectly.

Geography: Mountains, rivers, deserts, forests, islands, oceans, valleys, lakes, glaciers and volcanoes
shape where people live. Cities grow near harbours and fertile plains; villages cling to hillsides; roads
and railways follow the easiest paths between them.

Health: Drink enough water, sleep seven or eight hours, walk outside every day, and eat vegetables, fruit,
beans, nuts and whole grains. Doctors recommend regular exercise, because strong muscles and a healthy
heart protect against many illnesses.

Music: The orchestra tuned their violins, cellos, flutes, clarinets, trumpets and drums. The conductor
raised her baton, the audience fell silent, and the symphony began softly before building to a powerful,
joyful finale that brought everyone to their feet.

Sports: The football match ended in a draw after extra time. Both goalkeepers made brilliant saves, the
referee showed three yellow cards, and thousands of supporters sang loudly in the rain until the final
whistle.

Travel: Our train leaves the central station at half past nine and arrives in the capital shortly before
noon. Remember your passport, tickets, charger, umbrella and a warm jacket; the museum, the cathedral and
the market are all within walking distance of the hotel.

Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. January, February, March, April, May,
June, July, August, September, October, November, December. Spring, summer, autumn, winter. Red, orange,
yellow, green, blue, purple, black, white, grey, brown, pink. One, two, three, four, five, six, seven,
eight, nine, ten, eleven, twelve, twenty, thirty, hundred, thousand, million, billion.
)corpus";
}

}  // namespace strata::make_model
